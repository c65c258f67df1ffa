package wire

// The types are generated from the API's spec; the server interface in the
// api package (../generate.go) refers to them.
//go:generate go tool oapi-codegen -config cfg.yaml ../openapi.yaml
