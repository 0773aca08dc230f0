// Placements of the Collector's loadbalancingexporter v0.161.0, the golden file of
// tests/evaluate/test_routing.py. Regenerate (Go >= 1.22, the exporter in the module cache after
// scripts/build_stack.sh):
//
//	D=$(go env GOMODCACHE)/github.com/open-telemetry/opentelemetry-collector-contrib/exporter/loadbalancingexporter@v0.161.0
//	T=$(mktemp -d); sed 's/^package .*/package main/; s| // import.*||' $D/consistent_hashing.go > $T/ring.go
//	cp main.go $T/ && (cd $T && go mod init ring >/dev/null 2>&1 && go mod edit -go=1.23 && go run .) > placements.json
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

func main() {
	out := map[string]string{}
	for _, n := range []int{1, 2, 3, 4, 8} {
		eps := []string{}
		for i := 0; i < n; i++ {
			eps = append(eps, fmt.Sprintf("processor-%d:4317", i))
		}
		r := newHashRing(eps)
		var jobs, traces strings.Builder
		for k := 0; k < 1000; k++ {
			ep := r.endpointFor([]byte(fmt.Sprintf("mycroft.job.id=job-%d|", k)))
			jobs.WriteString(strings.TrimSuffix(strings.TrimPrefix(ep, "processor-"), ":4317"))
			tid := make([]byte, 16)
			binary.BigEndian.PutUint64(tid[8:], uint64(k)*0x9E3779B97F4A7C15)
			ep = r.endpointFor(tid)
			traces.WriteString(strings.TrimSuffix(strings.TrimPrefix(ep, "processor-"), ":4317"))
		}
		out[fmt.Sprintf("jobs/%d", n)] = jobs.String()
		out[fmt.Sprintf("traces/%d", n)] = traces.String()
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	enc.Encode(out)
}
