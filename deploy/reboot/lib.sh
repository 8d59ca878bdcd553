# shellcheck shell=bash
# Shared by shutdown.sh and startup.sh (kustos reboot safety, docs/maintenance-extras.md).
# Sourced, never run. Settings come from the environment (the unit's EnvironmentFile,
# /etc/default/kustos-reboot):
#   KUBECONFIG                      credentials (default: /etc/kubernetes/admin.conf when it
#                                   exists, else /etc/kubernetes/kubelet.conf)
#   KUSTOS_NODE_NAME                the node's registered name (default: the kubelet's
#                                   --hostname-override, else the lowercased hostname)
#   KUSTOS_KUBELET_FLAG_FILES       files searched for --hostname-override (space separated)
#   KUSTOS_KUBECTL                  kubectl to run (default: kubectl on PATH)
#   KUSTOS_REQUEST_TIMEOUT          each API request's bound (default 10s)

# The mark shutdown.sh leaves on a node it cordoned, so that startup.sh uncordons only what
# it cordoned itself (a node an administrator cordoned stays cordoned across the reboot).
# shellcheck disable=SC2034 # used by the scripts that source this file
readonly CORDON_ANNOTATION="kustos.dev/reboot-cordoned"

log() {
    printf '%s: %s\n' "${0##*/}" "$*" >&2
}

default_kubeconfig() {
    if [[ -z "${KUBECONFIG:-}" ]]; then
        if [[ -r /etc/kubernetes/admin.conf ]]; then
            KUBECONFIG=/etc/kubernetes/admin.conf
        else
            KUBECONFIG=/etc/kubernetes/kubelet.conf
        fi
    fi
    export KUBECONFIG
}

k() {
    "${KUSTOS_KUBECTL:-kubectl}" --request-timeout="${KUSTOS_REQUEST_TIMEOUT:-10s}" "$@"
}

# The value of --hostname-override in kubelet arguments read on stdin (either
# --hostname-override=NAME or --hostname-override NAME), or nothing.
hostname_override_in() {
    local words word take_next=0
    # Quotes of an env file (KUBELET_KUBEADM_ARGS="--a=b --c=d") and NULs of /proc cmdline
    # become spaces.
    words=$(tr '\0"'"'"'' '   ')
    for word in $words; do
        # An assignment's value: KUBELET_EXTRA_ARGS=--hostname-override NAME in an env file,
        # Environment=KUBELET_EXTRA_ARGS=... in a systemd drop-in.
        while [[ "$word" =~ ^[A-Za-z_][A-Za-z0-9_]*=(.*)$ ]]; do
            word=${BASH_REMATCH[1]}
        done
        if ((take_next)); then
            printf '%s\n' "$word"
            return 0
        fi
        case "$word" in
            --hostname-override=*) printf '%s\n' "${word#--hostname-override=}"; return 0 ;;
            --hostname-override) take_next=1 ;;
        esac
    done
    return 1
}

# The name the kubelet registered this node under.
node_name() {
    if [[ -n "${KUSTOS_NODE_NAME:-}" ]]; then
        printf '%s\n' "$KUSTOS_NODE_NAME"
        return 0
    fi
    local found="" file pid
    # The running kubelet's own arguments first (at shutdown it still runs: the unit is
    # ordered after kubelet.service, so it is stopped before it).
    for pid in $(pgrep -x kubelet 2>/dev/null || true); do
        if found=$(hostname_override_in <"/proc/$pid/cmdline" 2>/dev/null); then
            printf '%s\n' "$found"
            return 0
        fi
    done
    local files="${KUSTOS_KUBELET_FLAG_FILES:-/var/lib/kubelet/kubeadm-flags.env /etc/default/kubelet /etc/sysconfig/kubelet /etc/systemd/system/kubelet.service.d/10-kubeadm.conf}"
    for file in $files; do
        if [[ -r "$file" ]] && found=$(hostname_override_in <"$file"); then
            printf '%s\n' "$found"
            return 0
        fi
    done
    # The kubelet's default: the hostname, lowercased.
    hostname | tr '[:upper:]' '[:lower:]'
}
