//go:build tools

// Package tools records the etcd commands this module builds, so that
// `go mod tidy` keeps every dependency they need in go.sum.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
