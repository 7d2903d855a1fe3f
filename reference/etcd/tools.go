//go:build tools

// Package tools only pins, for `go mod tidy`, the programs scripts/reference builds.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
