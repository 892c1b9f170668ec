"""The model layer: the provider seam (`provider`), the Ollama provider (`ollama`) and, later,
the agent loop that drives a provider through a step."""
