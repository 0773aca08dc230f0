"""A counting OTLP gRPC trace (and metrics) receiver (its own process, so its CPU is not the agent's).

usage: python sink.py PORT_FILE   — writes the bound port to PORT_FILE, serves until killed.
The count of received spans is reported through a tiny second RPC-free channel: the
file PORT_FILE + ".count", rewritten after every request, and the bytes of the trace requests
received (OTLP protobuf as sent, before any gzip) in PORT_FILE + ".bytes". Metrics requests are accepted
(and their data points counted in PORT_FILE + ".metrics") so the agent's metric export runs as it
would against a Collector.
"""

import os
import sys
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, count_file: str):
        self.count_file = count_file
        self.spans = 0
        self.bytes = 0

    def Export(self, request, context):  # noqa: N802
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        self.bytes += request.ByteSize()  # the agent writes canonical protobuf: its wire size
        for path, value in ((self.count_file[:-len(".count")] + ".bytes", self.bytes), (self.count_file, self.spans)):
            with open(path + ".tmp", "w") as f:
                f.write(str(value))
            os.replace(path + ".tmp", path)
        return trace_service_pb2.ExportTraceServiceResponse()


class MetricSink(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, count_file: str):
        self.count_file = count_file
        self.points = 0

    def Export(self, request, context):  # noqa: N802
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    self.points += len(getattr(m, kind).data_points) if kind else 0
        with open(self.count_file + ".tmp", "w") as f:
            f.write(str(self.points))
        os.replace(self.count_file + ".tmp", self.count_file)
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main() -> None:
    port_file = sys.argv[1]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Sink(port_file + ".count"), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricSink(port_file + ".metrics"), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(port_file + ".tmp", port_file)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
