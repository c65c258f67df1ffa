package api

// The request and response types are generated into the leaf package wire
// (wire/generate.go), which clients import without linking the node; this
// package gets the server interface and the embedded spec.
//go:generate go tool oapi-codegen -config cfg.yaml openapi.yaml
