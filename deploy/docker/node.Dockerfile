# An AgentENV node: aenvd and aenv-storaged (static binaries) on Debian with QEMU and the
# tools the guest image build uses. Built offline from our binaries plus Debian's packages:
#   make build && docker build -f deploy/docker/node.Dockerfile -t aenv-node .
# It runs as root inside the container but NOT privileged: the compose file and the
# Kubernetes DaemonSet drop every capability and add back only NET_ADMIN, SYS_ADMIN, ...
# (see deploy/compose.yaml), with /dev/kvm and /dev/net/tun as the only devices.
# The base image is pinned by digest (dependabot's docker ecosystem keeps it current).
FROM debian:bookworm-slim@sha256:4b50eb66f977b4062683ff434ef18ac191da862dbe966961bc11990cf5791a8d
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      qemu-system-x86 qemu-utils e2fsprogs debootstrap debian-archive-keyring zstd xz-utils cpio \
      busybox-static iproute2 nftables ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ARG BIN=bin
COPY --chmod=0555 ${BIN}/aenvd ${BIN}/aenv-storaged ${BIN}/aenv ${BIN}/aenv-netcheck /usr/local/bin/
COPY --chmod=0555 ${BIN}/aenv-agent /usr/local/lib/aenv/aenv-agent
COPY --chmod=0555 deploy/docker/node-entrypoint.sh /usr/local/bin/aenv-node-entrypoint
# State (templates, sandboxes, layers) and the guest image cache are volumes.
ENV AENVD_DATA_DIR=/var/lib/aenv \
    AENVD_GUEST_AGENT=/usr/local/lib/aenv/aenv-agent \
    AENVD_GUEST_ASSETS_CACHE=/var/cache/aenv/guest \
    AENVD_API_LISTEN=0.0.0.0:3000 \
    AENVD_API_PROXY_LISTEN=0.0.0.0:3001
VOLUME ["/var/lib/aenv", "/var/cache/aenv"]
EXPOSE 3000 3001
STOPSIGNAL SIGTERM
# The entrypoint makes the container's own control groups writable, then execs aenvd.
ENTRYPOINT ["/usr/local/bin/aenv-node-entrypoint"]
