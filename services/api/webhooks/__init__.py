"""Webhooks: a durable outbox in Redis, signed deliveries (Standard Webhooks), SSRF guard."""
