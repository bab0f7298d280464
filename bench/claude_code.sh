#!/usr/bin/env bash
# Issue 25's acceptance: `claude -p` (npm @anthropic-ai/claude-code) against `ggufdesk serve --ctx 32768`.
#   CLAUDE=path/to/claude [SERVE_ARGS=--lookup] bench/claude_code.sh [MODEL.gguf]     (default: the starter)
# Prints Claude Code's exit code, its wall time and the server's request/token counters.
# CLAUDE_CODE_MAX_OUTPUT_TOKENS (MAXOUT, default 256): a tiny base model never ends its turn by itself and
# Claude Code asks for 32,000 tokens; the API_* / *_TIMEOUT_MS variables let it wait for a slow prefill.
set -u
root=$(cd "$(dirname "$0")/.." && pwd); work=$(mktemp -d); port=${PORT:-18192}
model=${1:-$("$root/.venv/bin/python" -c "from ggufdesk.core.starter import starter_model_path as p; print(p())")}
GGUFDESK_PROMPT_CACHE=$work/cache "$root/.venv/bin/python" -m ggufdesk serve "$model" --ctx 32768 --port "$port" \
  --temperature 0 --request-timeout 0 ${SERVE_ARGS:-} > "$work/serve.log" 2>&1 & sp=$!
trap 'kill $sp 2>/dev/null; wait $sp 2>/dev/null; rm -rf "$work"' EXIT
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do sleep 1; done
id=$(curl -s "http://127.0.0.1:$port/v1/models" | python3 -c "import sys,json; print(json.load(sys.stdin)['data'][0]['id'])")
echo "model $id; $("${CLAUDE:-claude}" --version)"
t0=$(date +%s)
HOME=$work ANTHROPIC_BASE_URL=http://127.0.0.1:$port ANTHROPIC_API_KEY=local CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 API_TIMEOUT_MS=1800000 API_FORCE_IDLE_TIMEOUT=0 \
  CLAUDE_STREAM_IDLE_TIMEOUT_MS=1800000 CLAUDE_CODE_MAX_OUTPUT_TOKENS=${MAXOUT:-256} \
  timeout 2700 "${CLAUDE:-claude}" -p "Reply with the single word hello." --model "$id" > "$work/out" 2> "$work/err"
echo "claude exit code $?; $(( $(date +%s) - t0 )) s"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^ggufdesk_(requests_total|prompt_tokens_total|prompt_tokens_cached_total|generation_tokens_total|speculative_(drafted|accepted)_tokens_total)'
echo "--- stdout (first 300 bytes)"; head -c 300 "$work/out"; echo; echo "--- stderr"; tail -c 300 "$work/err"
