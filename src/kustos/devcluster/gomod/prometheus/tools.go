//go:build tools

// Package tools records the Prometheus commands this module builds (prometheus, to scrape the
// operator in the alert test; promtool, to check and unit-test the chart's alert rules), so that
// `go mod tidy` keeps every dependency they need in go.sum.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
