"""Code that both the API and the workers import: settings, schemas, job store, queue names."""
