"""The MCP side: config loading, the client adapter (the only module importing mcp's client), ToolManager, cache,
tool-call formats."""
