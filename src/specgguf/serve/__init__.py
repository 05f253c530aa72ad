"""The OpenAI-compatible HTTP server: routes and streaming (`server`), request parsing and errors (`openai_api`)."""
