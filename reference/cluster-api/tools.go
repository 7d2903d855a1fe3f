//go:build tools

// Package tools keeps clusterctl in this module's requirements (built by scripts/reference).
package tools

import _ "sigs.k8s.io/cluster-api/cmd/clusterctl"
