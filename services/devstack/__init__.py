"""Run the whole stack on one machine (`make run`) and in tests: Redis, an S3 server, the API,
the workers. Development only: the wheel and the images leave it out."""
