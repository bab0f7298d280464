"""MCP (Model Context Protocol) servers: configuration, the host that runs them, and results."""
