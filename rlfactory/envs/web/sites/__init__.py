"""Self-hosted web sites for the web environment: a shop, a forum and a wiki on SQLite, one server process for every
episode (`server.WebSites`), each episode with its own database copies (`store.EpisodeStore`)."""
