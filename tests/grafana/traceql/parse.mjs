// Parse TraceQL queries with Grafana's own grammar (@grafana/lezer-traceql, the parser Grafana's
// Tempo query editor uses). stdin: a JSON list of query strings; stdout: a JSON list with, per
// query, null (parsed cleanly) or the first error's offset and the text around it.
import { parser } from "@grafana/lezer-traceql";

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const results = JSON.parse(input).map((query) => {
    const tree = parser.parse(query);
    let error = null;
    tree.iterate({
      enter(node) {
        if (error === null && node.type.isError) {
          error = { from: node.from, near: query.slice(Math.max(0, node.from - 20), node.from + 20) };
        }
      },
    });
    return error;
  });
  process.stdout.write(JSON.stringify(results));
});
