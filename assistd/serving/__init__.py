"""The serving layer: the daemon, its HTTP API (OpenAI wire shapes and assistd's own),
the scheduler, the client, and the MCP tools."""
