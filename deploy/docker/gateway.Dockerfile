# aenv-gateway: the gateway (HTTP: the E2B API and the sandbox proxy, routed to the owning node).
# Built offline from the static binary (CGO_ENABLED=0; make build or make release), nothing else in the image:
#   make build && docker build -f deploy/docker/gateway.Dockerfile -t aenv-gateway .
# or from a release directory: --build-arg BIN=dist/<version>/aenv-<version>-linux-amd64
FROM scratch
ARG BIN=bin
COPY --chmod=0555 ${BIN}/aenv-gateway /usr/local/bin/aenv-gateway
# No root, no shell, no package manager; any uid works (nothing is written but the state volume).
USER 65532:65532
EXPOSE 3000
ENTRYPOINT ["/usr/local/bin/aenv-gateway"]
