"""The tool-result cache: protocol and keys (`base`), single-flight, the Redis backends, the factory, and the
`@redis_cache` decorator for code inside tool servers."""
