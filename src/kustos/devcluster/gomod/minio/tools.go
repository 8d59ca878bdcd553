//go:build tools

// Package tools records the MinIO server this module builds, so that
// `go mod tidy` keeps every dependency it needs in go.sum.
package tools

import (
	_ "github.com/minio/minio"
)
