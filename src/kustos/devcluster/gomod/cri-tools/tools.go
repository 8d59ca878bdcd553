//go:build tools

// Package tools records the cri-tools command this module builds, so that
// `go mod tidy` keeps every dependency it needs in go.sum.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
