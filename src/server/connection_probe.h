// server/connection_probe.h: is the client of a request still there?
//
// cpp-httplib 0.11 hands a handler the request but not its socket. A non-streaming request
// waits for its whole generation inside the handler, and a client that gives up meanwhile
// should abort it (free its pages and slot) instead of running to max_tokens. So the handler
// finds its own socket once: the fd whose local and peer addresses are the request's
// (local_addr:local_port, remote_addr:remote_port) - a TCP 4-tuple names one connection, and
// the connection stays open while its handler runs, so the match is exact. Linux-only
// (/proc/self/fd); where no match is found the probe reports "alive" and the request simply
// runs to its end. Streaming responses do not need this: httplib's DataSink::is_writable()
// already peeks at the socket.
#pragma once
#include <string>

namespace k3::server {

class ConnectionProbe {
 public:
  ConnectionProbe(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);
  bool found() const { return fd_ >= 0; }
  // True once the peer has closed (or reset) the connection. Data waiting to be read (a
  // pipelined next request) counts as alive. Never blocks.
  bool peer_closed() const;

 private:
  int fd_ = -1;
};

}  // namespace k3::server
