#!/usr/bin/env bash
# Open WebUI with ggufdesk as its Ollama connection, driven in a real headless browser (issue 25).
# Needs: `pip install open-webui` in its own venv (OWUI, default /tmp/owui), Debian's `chromium`,
# node and npm (puppeteer-core is installed under bench/open_webui/.node on the first run). Runs offline: no model downloads, no web search.
#   bench/open_webui/run.sh MODEL.gguf     -> docs/screenshots/open-webui-chat.png and the answer on stdout
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
OWUI=${OWUI:-/tmp/owui}; data=$(mktemp -d); out=${OUT:-$root/docs/screenshots/open-webui-chat.png}
"$root/.venv/bin/python" -m ggufdesk serve "$1" --port 18080 --ctx 8192 & gd=$!
DATA_DIR=$data WEBUI_AUTH=False OFFLINE_MODE=true HF_HUB_OFFLINE=1 ENABLE_OPENAI_API=False \
  OLLAMA_BASE_URL=http://127.0.0.1:18080 ENABLE_WEB_SEARCH=False RAG_EMBEDDING_ENGINE=ollama \
  WEBUI_SECRET_KEY=$(python3 -c "import secrets; print(secrets.token_hex(16))") "$OWUI/bin/open-webui" serve --host 127.0.0.1 --port 18081 & ow=$!
trap 'kill $gd $ow 2>/dev/null; rm -rf "$data"' EXIT
until curl -sf http://127.0.0.1:18081/health >/dev/null && curl -sf http://127.0.0.1:18080/health >/dev/null; do sleep 2; done
token=$(curl -sf -X POST http://127.0.0.1:18081/api/v1/auths/signin -H 'content-type: application/json' \
  -d '{"email":"","password":""}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
curl -sf http://127.0.0.1:18081/api/models -H "Authorization: Bearer $token" \
  | python3 -c 'import json,sys; print("models:", [m["id"] for m in json.load(sys.stdin)["data"]])'
version=$(curl -sf http://127.0.0.1:18081/api/version | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
curl -sf -X POST http://127.0.0.1:18081/api/v1/users/user/settings/update -H "Authorization: Bearer $token" \
  -H 'content-type: application/json' -d "{\"ui\":{\"version\":\"$version\"}}" >/dev/null  # no release-notes pop-up
echo "$token" > "$data/token"
[ -d "$here/.node/node_modules/puppeteer-core" ] || npm install -s --prefix "$here/.node" puppeteer-core@23
NODE_PATH="$here/.node/node_modules" TOKEN_FILE="$data/token" SHOT="$out" node "$here/ui.js"
