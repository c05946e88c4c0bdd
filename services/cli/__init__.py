"""`fibermill`: submit jobs to a Fibermill API, follow them, and fetch their outputs."""
