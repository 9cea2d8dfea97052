/* peer_io.h — messages between the processes of a multi-process pipeline
 * over the TCP connections parallel/rendezvous.c opened: each message is a
 * uint32 length, then its bytes. Every wait can have a deadline, and a
 * closed connection is an error naming the peer. */
#ifndef CLLM_PEER_IO_H
#define CLLM_PEER_IO_H

#include <stddef.h>

#include "base/err.h"

/* Exactly n bytes to / from fd; timeout_s <= 0: no deadline. */
int peer_write(int fd, const void *buf, size_t n, double timeout_s, const char *peer, Err *err);
int peer_read(int fd, void *buf, size_t n, double timeout_s, const char *peer, Err *err);
/* One framed message. peer_recv grows *buf (*cap) and refuses more than max bytes. */
int peer_send(int fd, const void *buf, size_t len, double timeout_s, const char *peer, Err *err);
int peer_recv(int fd, void **buf, size_t *cap, size_t *len, size_t max, double timeout_s, const char *peer, Err *err);

#endif
