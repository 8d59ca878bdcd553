#!/usr/bin/env bash
# kustos reboot safety, on shutdown (ExecStop of kustos-reboot.service): cordon this node,
# delete its pods that use PersistentVolumeClaims (outside system namespaces), and wait,
# with a bound, until those pods are gone and their volumes are detached from this node, so
# that they start elsewhere at once instead of after the node-lost timeouts (minutes), and
# no volume is cut off mid-write by the power going.
#
# Settings (besides lib.sh's):
#   KUSTOS_SHUTDOWN_TIMEOUT   seconds to wait for pods and volumes (default 240; keep it below
#                             the unit's TimeoutStopSec)
#   KUSTOS_SKIP_NAMESPACES    namespaces left alone (default: kube-system kube-public
#                             kube-node-lease)
#   KUSTOS_POLL_SECONDS       how often to look again (default 2)
#
# Exit status: 0 when every such pod is gone and its volumes detached, 1 when the bound
# passed first (what still holds on is logged), 2 when the API could not be reached.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

timeout_seconds=${KUSTOS_SHUTDOWN_TIMEOUT:-240}
poll_seconds=${KUSTOS_POLL_SECONDS:-2}
skip_namespaces=" ${KUSTOS_SKIP_NAMESPACES:-kube-system kube-public kube-node-lease} "

default_kubeconfig
node=$(node_name)
log "node $node (KUBECONFIG $KUBECONFIG)"

if ! unschedulable=$(k get node "$node" -o 'jsonpath={.spec.unschedulable}'); then
    log "cannot read node $node from the API server: nothing done"
    exit 2
fi
if [[ "$unschedulable" == "true" ]]; then
    log "node $node is already cordoned (left as it is; startup.sh will not uncordon it)"
else
    # The mark first: if the cordon then fails, startup.sh finds nothing to undo.
    k annotate node "$node" --overwrite "$CORDON_ANNOTATION=$(date -u +%Y-%m-%dT%H:%M:%SZ)" >/dev/null
    k cordon "$node" >/dev/null
    log "cordoned node $node"
fi

# "namespace name claim..." of every pod on this node that uses a claim (and is ours to move).
pods_with_claims() {
    # "owner:" is followed by the first owner's kind, if any, so that every line has its fields.
    local template='{range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{" owner:"}{.metadata.ownerReferences[0].kind}{" -"}{range .spec.volumes[*]}{" "}{.persistentVolumeClaim.claimName}{end}{"\n"}{end}'
    k get pods --all-namespaces --field-selector "spec.nodeName=$node" -o "jsonpath=$template" |
        while read -r namespace name owner _ claims; do
            [[ -n "${claims// /}" ]] || continue
            [[ "$skip_namespaces" == *" $namespace "* ]] && continue
            # A DaemonSet's pod would come straight back to this node (cordoned or not).
            [[ "$owner" == "owner:DaemonSet" ]] && continue
            printf '%s %s %s\n' "$namespace" "$name" "$claims"
        done
}

if ! targets=$(pods_with_claims); then
    log "cannot list the pods of node $node: nothing deleted"
    exit 2
fi

volumes=()
while read -r namespace name claims; do
    [[ -n "$namespace" ]] || continue
    log "deleting pod $namespace/$name (claims: $claims)"
    # Graceful, with the pod's own grace period; only on this node (a StatefulSet's pod of the
    # same name may already run elsewhere).
    k delete pods -n "$namespace" --wait=false \
        --field-selector "metadata.name=$name,spec.nodeName=$node" >/dev/null
    for claim in $claims; do
        volume=$(k get pvc -n "$namespace" "$claim" -o 'jsonpath={.spec.volumeName}' 2>/dev/null || true)
        [[ -n "$volume" ]] && volumes+=("$volume")
    done
done <<<"$targets"

# The volumes of this node's VolumeAttachments that belong to the deleted pods' claims.
attached() {
    local template='{range .items[*]}{.spec.nodeName}{" "}{.spec.source.persistentVolumeName}{"\n"}{end}'
    local listing
    if ! listing=$(k get volumeattachments -o "jsonpath=$template" 2>/dev/null); then
        return 0 # not listable with these credentials: the pods' absence is what we have
    fi
    local attached_node volume wanted
    while read -r attached_node volume; do
        [[ "$attached_node" == "$node" ]] || continue
        for wanted in "${volumes[@]}"; do
            if [[ "$volume" == "$wanted" ]]; then
                printf '%s\n' "$volume"
            fi
        done
    done <<<"$listing"
}

deadline=$((SECONDS + timeout_seconds))
while :; do
    remaining_pods=$(pods_with_claims || echo "(the API did not answer)")
    remaining_volumes=""
    if ((${#volumes[@]})); then
        remaining_volumes=$(attached)
    fi
    if [[ -z "$remaining_pods" && -z "$remaining_volumes" ]]; then
        log "node $node: no pod with a claim left, their volumes detached"
        exit 0
    fi
    if ((SECONDS >= deadline)); then
        log "gave up after ${timeout_seconds}s; still there:"
        [[ -z "$remaining_pods" ]] || log "  pods: $(tr '\n' ';' <<<"$remaining_pods")"
        [[ -z "$remaining_volumes" ]] || log "  attached volumes: $(tr '\n' ' ' <<<"$remaining_volumes")"
        exit 1
    fi
    sleep "$poll_seconds"
done
