#!/bin/sh
# Writes secrets.env beside this script, the Secret `fibermill-secrets` is generated from it
# (kustomization.yaml): a random API key (only its sha256 digest is kept; the key is printed
# once) and a random Redis password. It never overwrites an existing file, and git ignores it:
# secrets are made per installation, never committed. The webhook signing secret is not here:
# the API generates one per installation and keeps it in Redis (add `webhook-secret=whsec_...`
# to manage one yourself).
set -eu
cd "$(dirname "$0")"
if [ -e secrets.env ]; then
  echo "secrets.env exists; leaving it as it is"
  exit 0
fi
random_hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
key="fm_$(random_hex 24)"
umask 077
{
  echo "api-keys=sha256:$(printf %s "$key" | sha256sum | cut -d' ' -f1)"
  echo "redis-password=$(random_hex 16)"  # hex: it goes into a redis:// URL
} > secrets.env
echo "wrote $(pwd)/secrets.env"
echo "your API key (shown once; only its digest is stored): $key"
