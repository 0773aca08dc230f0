//go:build tools

// Package tools pins the Jaeger v2 binary as a dependency of this wrapper module.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
