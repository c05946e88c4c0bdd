"""Measurements of a local stack and of its engine beside its peers (`make bench`,
`make bench-gpu`), the soak, and the chaos run (`make chaos`, benchmarks/chaos/). No service
imports this: the wheel and the images leave it out."""
