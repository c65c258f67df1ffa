// Package schedulerpb is the scheduler's gRPC API, generated from
// scheduler.proto (protoc with protoc-gen-go and protoc-gen-go-grpc); the
// generated code is committed and CI does not regenerate it.
package schedulerpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative scheduler.proto
