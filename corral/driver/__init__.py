"""Generated protobuf and gRPC code of corral.driver (see protos/)."""
