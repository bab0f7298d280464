"""The local OpenAI/Anthropic-compatible HTTP server: routes, service layer, engine pool."""
