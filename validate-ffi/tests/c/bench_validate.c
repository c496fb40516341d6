/* Times the hot-path verdict through the C ABI, as a C backend would call it.
 * Usage: bench_validate <packet.json> <milliseconds> [rounds]. Calls xagent_packet_is_valid
 * on the packet for about <milliseconds> per round, best of [rounds] (default 5), and prints
 * {"ns_per_call": N}. Built and run by `cargo xtask bench-decode`. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "xagent_validate.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc != 3 && argc != 4) {
    fprintf(stderr, "usage: %s <packet.json> <milliseconds> [rounds]\n", argv[0]);
    return 2;
  }
  FILE *file = fopen(argv[1], "rb");
  if (!file) {
    fprintf(stderr, "cannot open %s\n", argv[1]);
    return 2;
  }
  fseek(file, 0, SEEK_END);
  long size = ftell(file);
  fseek(file, 0, SEEK_SET);
  unsigned char *packet = malloc((size_t)size);
  if (!packet || fread(packet, 1, (size_t)size, file) != (size_t)size) {
    fprintf(stderr, "cannot read %s\n", argv[1]);
    return 2;
  }
  fclose(file);
  double millis = atof(argv[2]);
  int rounds = argc == 4 ? atoi(argv[3]) : 5;
  XagentPacketValidator *validator = xagent_packet_validator_new(NULL, 0);
  if (xagent_packet_is_valid(validator, packet, (size_t)size, XAGENT_SENDER_UNKNOWN) != 1) {
    fprintf(stderr, "the sample packet is not valid\n");
    return 1;
  }
  double best = 0;
  volatile int sink = 0;
  for (int round = 0; round < rounds; round++) {
    long n = 0;
    double start = now_ns();
    double deadline = start + millis * 1e6;
    while (now_ns() < deadline) {
      for (int i = 0; i < 64; i++) {
        sink += xagent_packet_is_valid(validator, packet, (size_t)size, XAGENT_SENDER_UNKNOWN);
      }
      n += 64;
    }
    double ns = (now_ns() - start) / (double)n;
    if (best == 0 || ns < best) {
      best = ns;
    }
  }
  xagent_packet_validator_free(validator);
  free(packet);
  printf("{\"ns_per_call\": %.1f}\n", best);
  return sink > 0 ? 0 : 1;
}
