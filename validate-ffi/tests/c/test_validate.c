/* Calls the validators through the C ABI, as a C backend would.
 * Usage: test_validate <dir with card.json, card-invalid.json, descriptor.json, packet.json,
 * SKILL.md>. Exits 0 when every check passes. Built and run by tests/c_abi.rs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xagent_validate.h"

static int failures = 0;

#define CHECK(cond, what)                                                   \
  do {                                                                      \
    if (cond) {                                                             \
      printf("ok   %s\n", what);                                            \
    } else {                                                                \
      printf("FAIL %s\n", what);                                            \
      failures++;                                                           \
    }                                                                       \
  } while (0)

static char *read_file(const char *dir, const char *name, size_t *len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *file = fopen(path, "rb");
  if (!file) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(2);
  }
  fseek(file, 0, SEEK_END);
  long size = ftell(file);
  fseek(file, 0, SEEK_SET);
  char *data = malloc((size_t)size + 1);
  if (!data || fread(data, 1, (size_t)size, file) != (size_t)size) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(2);
  }
  data[size] = '\0';
  fclose(file);
  *len = (size_t)size;
  return data;
}

/* Counts the occurrences of a substring. */
static int count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) {
    n++;
  }
  return n;
}

static int is_valid(const char *report) { return strstr(report, "\"valid\":true") != NULL; }

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <data dir>\n", argv[0]);
    return 2;
  }
  const char *dir = argv[1];
  size_t card_len, bad_len, desc_len, packet_len, skill_len;
  char *card = read_file(dir, "card.json", &card_len);
  char *bad = read_file(dir, "card-invalid.json", &bad_len);
  char *desc = read_file(dir, "descriptor.json", &desc_len);
  char *packet = read_file(dir, "packet.json", &packet_len);
  char *skill = read_file(dir, "SKILL.md", &skill_len);
  const uint8_t *card_bytes = (const uint8_t *)card;

  const char *version = xagent_validate_version();
  CHECK(strstr(version, "\"protocol\":\"3.0\"") != NULL, "version names protocol 3.0");
  CHECK(strstr(version, "\"abi\":1") != NULL, "version names the ABI version");
  CHECK(XAGENT_VALIDATE_ABI_VERSION == 1, "header ABI version is 1");

  char *report = xagent_validate_card(card_bytes, card_len);
  CHECK(report != NULL && is_valid(report), "valid card is valid");
  xagent_validate_free(report);

  report = xagent_validate_card((const uint8_t *)bad, bad_len);
  CHECK(!is_valid(report), "invalid card is invalid");
  CHECK(count(report, "\"severity\":\"error\"") >= 5, "invalid card reports several errors");
  CHECK(strstr(report, "\"rule\":\"card.protocol_version\"") != NULL, "card.protocol_version reported");
  CHECK(strstr(report, "\"rule\":\"card.tool_id_format\"") != NULL, "card.tool_id_format reported");
  xagent_validate_free(report);

  report = xagent_validate_descriptor((const uint8_t *)desc, desc_len, card_bytes, card_len);
  CHECK(is_valid(report), "descriptor is valid against its card");
  xagent_validate_free(report);

  report = xagent_validate_descriptor((const uint8_t *)desc, desc_len, NULL, 0);
  CHECK(is_valid(report), "descriptor is valid without a card");
  xagent_validate_free(report);

  report = xagent_validate_packet((const uint8_t *)packet, packet_len, card_bytes, card_len);
  CHECK(is_valid(report), "packet is valid against the card");
  xagent_validate_free(report);

  const char *no_schema = "{\"packet_id\":\"\",\"type\":\"chat.message\",\"payload\":{}}";
  report = xagent_validate_packet((const uint8_t *)no_schema, strlen(no_schema), NULL, 0);
  CHECK(!is_valid(report), "broken packet is invalid");
  CHECK(count(report, "\"rule\":") >= 2, "broken packet reports several violations");
  xagent_validate_free(report);

  XagentPacketValidator *validator = xagent_packet_validator_new(card_bytes, card_len);
  CHECK(validator != NULL, "a packet validator is made from the card");
  CHECK(xagent_packet_is_valid(validator, (const uint8_t *)packet, packet_len, XAGENT_SENDER_UNKNOWN) == 1,
        "hot path: the packet is valid against the card");
  CHECK(xagent_packet_is_valid(validator, (const uint8_t *)no_schema, strlen(no_schema), XAGENT_SENDER_XAGENT) == 0,
        "hot path: the broken packet is invalid");
  CHECK(xagent_packet_is_valid(NULL, (const uint8_t *)packet, packet_len, 99) == 1,
        "hot path: a NULL validator checks without a card");
  CHECK(xagent_packet_is_valid(validator, NULL, 5, XAGENT_SENDER_UNKNOWN) == 0,
        "hot path: a NULL packet pointer with a length is invalid");
  xagent_packet_validator_free(validator);
  xagent_packet_validator_free(NULL);
  CHECK(xagent_packet_validator_new((const uint8_t *)"[1]", 3) == NULL, "a non-object card makes no validator");

  report = xagent_validate_skill((const uint8_t *)skill, skill_len, card_bytes, card_len);
  CHECK(is_valid(report), "skill is valid against its card");
  xagent_validate_free(report);

  const char *wrong_skill = "---\nname: connector-im-other\n---\n# Other\n";
  report = xagent_validate_skill((const uint8_t *)wrong_skill, strlen(wrong_skill), card_bytes, card_len);
  CHECK(!is_valid(report), "skill named for another card is invalid");
  xagent_validate_free(report);

  const uint8_t not_utf8[] = {'{', 0xff, 0xfe, '}'};
  report = xagent_validate_card(not_utf8, sizeof not_utf8);
  CHECK(report != NULL && !is_valid(report), "non-UTF-8 input gives an invalid report");
  CHECK(strstr(report, "\"rule\":\"document.not_json\"") != NULL, "non-UTF-8 input is document.not_json");
  xagent_validate_free(report);

  report = xagent_validate_descriptor((const uint8_t *)desc, desc_len, not_utf8, sizeof not_utf8);
  CHECK(strstr(report, "\"path\":\"/card\"") != NULL, "non-UTF-8 card is reported at /card");
  xagent_validate_free(report);

  report = xagent_validate_card(NULL, 12);
  CHECK(report != NULL && !is_valid(report), "NULL input gives an invalid report");
  xagent_validate_free(report);

  xagent_validate_free(NULL);

  free(card);
  free(bad);
  free(desc);
  free(packet);
  free(skill);
  printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
