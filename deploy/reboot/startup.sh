#!/usr/bin/env bash
# kustos reboot safety, on start (ExecStart of kustos-reboot.service): wait for the API
# server, then uncordon this node if shutdown.sh cordoned it (a node an administrator
# cordoned before the reboot stays cordoned).
#
# Settings (besides lib.sh's):
#   KUSTOS_STARTUP_TIMEOUT   seconds to wait for the API server and this node's Node object
#                            (default 600: a control-plane node's own API server starts too)
#   KUSTOS_POLL_SECONDS      how often to look again (default 5)
#
# Exit status: 0 when the node is as it should be, 1 when the API server did not answer in
# time (the unit ignores it, so that the shutdown side still runs at the next reboot).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

timeout_seconds=${KUSTOS_STARTUP_TIMEOUT:-600}
poll_seconds=${KUSTOS_POLL_SECONDS:-5}

default_kubeconfig
node=$(node_name)
log "node $node (KUBECONFIG $KUBECONFIG)"

deadline=$((SECONDS + timeout_seconds))
until mark=$(k get node "$node" -o "jsonpath={.metadata.annotations.kustos\.dev/reboot-cordoned}" 2>/dev/null); do
    if ((SECONDS >= deadline)); then
        log "the API server did not show node $node within ${timeout_seconds}s; left cordoned"
        exit 1
    fi
    sleep "$poll_seconds"
done

if [[ -z "$mark" ]]; then
    log "node $node was not cordoned by shutdown.sh: left as it is"
    exit 0
fi
k uncordon "$node" >/dev/null
k annotate node "$node" "$CORDON_ANNOTATION-" >/dev/null
log "uncordoned node $node (cordoned by shutdown.sh at $mark)"
