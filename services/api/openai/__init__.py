"""OpenAI-compatible endpoints: each call is translated onto a Fibermill job (queued,
prioritised, batched, rate-limited, counted and recoverable like any other), and the job back
into OpenAI's answer."""
