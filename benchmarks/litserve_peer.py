"""LitServe serving a causal LM from a local directory: the peer server in `make bench`.

    python -m benchmarks.litserve_peer --model-dir DIR --port P [--max-batch-size 32]

POST /predict {"prompt": str, "max_new_tokens": int} -> {"text": str, "tokens": int, "batch":
int, "generate_s": float} (the size and model time of the batch it ran in). Requests
are batched by LitServe (up to --max-batch-size, waiting at most --batch-timeout seconds for a
batch to fill) and run as one greedy `generate` call padded to the batch's largest budget, the
same code as the in-process baseline (benchmarks/hf_generate.py). Needs the optional
`bench` extra (litserve).
"""

import argparse
import time
from pathlib import Path

import litserve as ls

from benchmarks import hf_generate


class GenerateAPI(ls.LitAPI):
    def __init__(self, model_dir: Path, max_batch_size: int, batch_timeout: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.model_dir = model_dir

    def setup(self, device) -> None:
        self.model, self.tokenizer = hf_generate.load(self.model_dir, device)

    def decode_request(self, request, **kwargs) -> tuple[str, int]:
        return str(request["prompt"]), int(request["max_new_tokens"])

    def predict(self, batch, **kwargs) -> list[dict]:
        prompts = [prompt for prompt, _ in batch]
        budgets = [n for _, n in batch]
        t0 = time.perf_counter()
        out = hf_generate.generate(self.model, self.tokenizer, prompts, budgets)
        took = time.perf_counter() - t0  # the batch's model time, for diagnosis
        return [{"text": text, "tokens": tokens, "batch": len(batch), "generate_s": took}
                for text, tokens in out]

    def encode_response(self, output, **kwargs) -> dict:
        return output


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-timeout", type=float, default=0.01)
    ap.add_argument("--timeout", type=float, default=300, help="a request's, in seconds")
    args = ap.parse_args()
    api = GenerateAPI(args.model_dir, args.max_batch_size, args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1,
                          timeout=args.timeout)
    server.run(host=args.host, port=args.port, num_api_servers=1, generate_client_file=False,
               log_level="warning")


if __name__ == "__main__":
    main()
