#!/usr/bin/env bash
# Provision one node of an Understudy Pacemaker cluster (Debian bookworm, systemd, root).
# Used by the Vagrantfile; the network-namespace tests (tests/pacemaker/netns.py) render the same corosync.conf
# and bootstrap CIB through the same deploy/clusterconf.py.
#
#   deploy/provision.sh INDEX NODE_ADDRESSES VIP [REPO]
#     INDEX           1-based position of this node in NODE_ADDRESSES (node names are node1, node2, ...)
#     NODE_ADDRESSES  comma-separated addresses of every node, e.g. 192.168.77.11,192.168.77.12,192.168.77.13
#     VIP             the virtual IP clients use
#     REPO            checkout of the project (default /vagrant)
# Environment: UNDERSTUDY_NO_STONITH=1 disables fencing (demo/test clusters without a fence device only).
set -euo pipefail
INDEX=$1; ADDRESSES=$2; VIP=$3; REPO=${4:-/vagrant}
PORT=5672
VENV=/opt/understudy/venv
IFS=, read -r -a ADDR <<<"$ADDRESSES"
COUNT=${#ADDR[@]}
log() { printf '[provision node%s] %s\n' "$INDEX" "$*"; }

log "packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq pacemaker corosync pcs resource-agents pacemaker-cli-utils libxml2-utils \
    python3-venv python3-dev gcc pkg-config libsasl2-dev libsasl2-modules sasl2-bin libssl-dev >/dev/null

log "understudy into $VENV"
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "$REPO"

log "OCF agent ocf:understudy:understudy"
mkdir -p /usr/lib/ocf/resource.d/understudy /var/lib/understudy
ln -sf "$REPO/resource_agents/understudy" /usr/lib/ocf/resource.d/understudy/understudy

log "corosync.conf"
NODES=()
for i in "${!ADDR[@]}"; do NODES+=(--node "node$((i + 1))=${ADDR[$i]}"); done
hostnamectl set-hostname "node$INDEX"
grep -q "node$INDEX" /etc/hosts || echo "${ADDR[$((INDEX - 1))]} node$INDEX" >>/etc/hosts
(cd "$REPO" && python3 -m deploy.clusterconf corosync --cluster-name understudy "${NODES[@]}") \
    >/etc/corosync/corosync.conf

if [[ ! -s /var/lib/pacemaker/cib/cib.xml ]]; then
    log "bootstrap CIB"
    FLAGS=()
    [[ ${UNDERSTUDY_NO_STONITH:-0} == 1 ]] && FLAGS+=(--no-stonith)
    (cd "$REPO" && python3 -m deploy.clusterconf cib "${FLAGS[@]}") >/var/lib/pacemaker/cib/cib.xml
    chown hacluster:haclient /var/lib/pacemaker/cib/cib.xml
    chmod 600 /var/lib/pacemaker/cib/cib.xml
fi

log "start corosync and pacemaker"
systemctl enable -q corosync pacemaker
systemctl restart corosync
systemctl start pacemaker

if [[ $INDEX == "$COUNT" ]]; then
    log "waiting for all $COUNT nodes"
    for _ in $(seq 1 120); do
        online=$(crm_mon -1 --output-as=xml 2>/dev/null | grep -c 'online="true"' || true)
        [[ $online -ge $COUNT ]] && break
        sleep 1
    done
    if crm_resource --list 2>/dev/null | grep -q 'ocf:understudy:understudy'; then
        log "resources already configured"
    else
        BROKERS=$(printf "%s:$PORT," "${ADDR[@]}"); BROKERS=${BROKERS%,}
        log "pcs setup (python3 -m ha.pacemaker, the same as ha-admin pacemaker-setup)"
        mkdir -p /root/understudy-setup
        (cd /root/understudy-setup && "$VENV/bin/python" -m ha.pacemaker --vip "$VIP" \
            --brokers-url "$BROKERS" --bindir "$VENV/bin")
    fi
fi
log "done"
