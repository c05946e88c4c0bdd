"""Run the whole stack on one machine (`make run`) and in tests: Redis, the API, the workers."""
