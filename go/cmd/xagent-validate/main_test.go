package main

import (
	"bytes"
	"strings"
	"testing"
)

const data = "../../../validate-ffi/tests/data/"

func TestRun(t *testing.T) {
	for _, c := range []struct {
		args   []string
		stdin  string
		status int
		out    string
	}{
		{[]string{data + "card.json"}, "", 0, `{"valid":true,"violations":[{"rule":"card.auth_field_secret"`},
		{[]string{data + "card-invalid.json"}, "", 1, `"rule":"card.protocol_version"`},
		{[]string{"-card", data + "card.json", data + "descriptor.json"}, "", 0, `{"valid":true,"violations":[]}`},
		{[]string{"-card", data + "card.json", data + "SKILL.md"}, "", 0, `{"valid":true,"violations":[]}`},
		{[]string{"-sender", "connector", data + "packet.json"}, "", 0, `{"valid":true,"violations":[]}`},
		{[]string{"-format", "text", data + "card-invalid.json"}, "", 1, "error card.protocol_version at /protocol_version: "},
		{[]string{"-sender", "connector", "-"}, `{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"chat.message",` +
			`"connector_channel_id":"c","time":1,"payload":{"message_id":"m","files":[{"type":"image","file_ref":"f"}]}}`,
			1, `"rule":"chat_message.download_url"`},
		{[]string{"-kind", "card", "-"}, "{oops", 1, `"rule":"document.not_json"`},
	} {
		var stdout, stderr bytes.Buffer
		status := run(c.args, strings.NewReader(c.stdin), &stdout, &stderr)
		if status != c.status || !strings.Contains(stdout.String(), c.out) {
			t.Errorf("%v: status %d, output %q %q; want %d and %q", c.args, status, stdout.String(), stderr.String(), c.status, c.out)
		}
	}
}

func TestRunRefusesWhatItCannotValidate(t *testing.T) {
	for _, args := range [][]string{
		{},
		{data + "card.json", data + "packet.json"},
		{"-format", "yaml", data + "card.json"},
		{data + "SKILL.md"},                       // a Skill needs its Card
		{"-sender", "xagent", data + "card.json"}, // a sender only for packets
		{"-sender", "platform", data + "packet.json"},
		{"-card", data + "card.json", data + "card.json"},
		{data + "README.md"}, // a .md that is a Skill, but no Card
		{"-kind", "ticket", data + "card.json"},
		{data + "missing.json"},
		{"-"}, // stdin holds no JSON object
	} {
		var stdout, stderr bytes.Buffer
		if status := run(args, strings.NewReader("not json"), &stdout, &stderr); status != 2 || stderr.Len() == 0 {
			t.Errorf("%v: status %d, stderr %q; want 2 and a reason", args, status, stderr.String())
		}
	}
}
