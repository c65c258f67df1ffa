# aenv-scheduler: the scheduler (gRPC: node registry, placement, bindings in Redis).
# Built offline from the static binary (CGO_ENABLED=0; make build or make release), nothing else in the image:
#   make build && docker build -f deploy/docker/scheduler.Dockerfile -t aenv-scheduler .
# or from a release directory: --build-arg BIN=dist/<version>/aenv-<version>-linux-amd64
FROM scratch
ARG BIN=bin
COPY --chmod=0555 ${BIN}/aenv-scheduler /usr/local/bin/aenv-scheduler
# No root, no shell, no package manager; any uid works (nothing is written but the state volume).
USER 65532:65532
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/aenv-scheduler"]
