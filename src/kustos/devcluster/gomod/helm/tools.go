//go:build tools

// Package tools records the helm command this module builds, so that
// `go mod tidy` keeps every dependency it needs in go.sum.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
