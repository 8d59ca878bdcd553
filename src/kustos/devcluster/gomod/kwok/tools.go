//go:build tools

// Package tools records the kwok commands this module builds, so that
// `go mod tidy` keeps every dependency they need in go.sum.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
