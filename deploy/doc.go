// Package deploy holds AgentENV's deployment files and their checks: the
// systemd unit and config templates that scripts/install.sh renders
// (systemd/), the container images (docker/), the compose file
// (compose.yaml) and the Kubernetes kustomization (k8s/). It has no code of
// its own; its tests install into a temporary root and verify the units with
// systemd-analyze, validate the manifests against the Kubernetes API types,
// check the compose file, the Dockerfiles and the CI workflows against the
// project's policy (no privilege where avoidable, pinned images and actions),
// and check that `make release` stamps the build identity.
package deploy
