//go:build tools

// Package tools records the CoreDNS command this module builds, so that
// `go mod tidy` keeps every dependency it needs in go.sum.
package tools

import (
	_ "github.com/coredns/coredns"
)
