package pbtxt

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/pbtxt/configpb"
)

func TestParseForms(t *testing.T) {
	// Every form below must give the same message as the canonical one.
	canonical := &configpb.ModelConfig{
		Name:         "m",
		MaxBatchSize: 8,
		Input: []*configpb.ModelInput{
			{Name: "a", DataType: configpb.DataType_TYPE_FP32, Dims: []int64{3, -1}},
			{Name: "b", DataType: configpb.DataType_TYPE_INT64, Dims: []int64{1}},
		},
	}
	for name, text := range map[string]string{
		"list":            `name: "m" max_batch_size: 8 input [ { name: "a" data_type: TYPE_FP32 dims: [ 3, -1 ] }, { name: "b" data_type: TYPE_INT64 dims: [ 1 ] } ]`,
		"repeated":        "name: \"m\"\nmax_batch_size: 8\ninput { name: \"a\" data_type: TYPE_FP32 dims: 3 dims: -1 }\ninput { name: \"b\" data_type: TYPE_INT64 dims: 1 }",
		"colon and angle": `name: 'm', max_batch_size: 8; input: < name: "a" data_type: 11 dims: [3, -1] > input: [ { name: "b", data_type: TYPE_INT64, dims: [1] } ]`,
		"comments":        "# header\nname: \"m\" # trailing\nmax_batch_size: 0x8\ninput [ { name: \"a\" data_type: TYPE_FP32 dims: [ 3, -1 ] }, # first\n{ name: \"b\" data_type: TYPE_INT64 dims: [ 1 ] } ]\n",
		"split strings":   `name: "" "m" max_batch_size: 010 input [ { name: "a" data_type: TYPE_FP32 dims: [ 3, -1 ] } ] input { name: "b" data_type: TYPE_INT64 dims: [ 1 ] }`,
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse([]byte(text))
			if err != nil {
				t.Fatalf("Parse = %v", err)
			}
			if !proto.Equal(got, canonical) {
				t.Errorf("Parse(%q) =\n%s\nwant\n%s", text, Print(got), Print(canonical))
			}
		})
	}
}

// valuesConfig spells values every way the text format allows.
const valuesConfig = `
		name: "caf\303\251 \x41\u00e9\n\t\"q\""
		model_transaction_policy { decoupled: True }
		response_cache: { enable: t }
		sequence_batching {
		  direct { minimum_slot_utilization: 0.5f }
		  control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ -inf, nan ] } ] } ]
		}
		parameters { key: "k" value: { string_value: "v1" } }
		parameters { key: "k" value: { string_value: "v2" } }
`

func TestParseValues(t *testing.T) {
	c, err := Parse([]byte(valuesConfig + "\t\tdynamic_batching_unused_check: 1\n"))
	if err == nil {
		t.Fatal("Parse accepted an unknown field")
	}
	c, err = Parse([]byte(valuesConfig))
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	if got, want := c.GetName(), "café Aé\n\t\"q\""; got != want {
		t.Errorf("name = %q, want %q", got, want)
	}
	if !c.GetModelTransactionPolicy().GetDecoupled() || !c.GetResponseCache().GetEnable() {
		t.Errorf("booleans True and t were not read as true")
	}
	if got := c.GetSequenceBatching().GetDirect().GetMinimumSlotUtilization(); got != 0.5 {
		t.Errorf("minimum_slot_utilization = %v, want 0.5", got)
	}
	ft := c.GetSequenceBatching().GetControlInput()[0].GetControl()[0].GetFp32FalseTrue()
	if len(ft) != 2 || !math.IsInf(float64(ft[0]), -1) || !math.IsNaN(float64(ft[1])) {
		t.Errorf("fp32_false_true = %v, want [-inf nan]", ft)
	}
	if got := c.GetParameters()["k"].GetStringValue(); got != "v2" {
		t.Errorf("parameters[k] = %q, want the later entry v2", got)
	}
	back, err := Parse(Print(c))
	if err != nil || !proto.Equal(c, back) {
		t.Errorf("round trip of special values failed: %v\n%s", err, Print(c))
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		line, col  int
		msg        string
	}{
		{"unknown field", "name: \"m\"\n  dimz: [1]", 2, 3, `unknown field "dimz" in inference.ModelConfig`},
		{"typo hint", "input [ { name: \"a\" dim: [1] } ]", 1, 21, `did you mean "dims"?`},
		{"bad enum", "input { data_type: TYPE_FLOAT32 }", 1, 20, `unknown value "TYPE_FLOAT32"`},
		{"missing colon", "name \"m\"", 1, 6, `expected ':' after field name "name"`},
		{"unterminated string", "name: \"abc\nplatform: \"x\"", 1, 7, "string is not terminated"},
		{"missing brace", "input {\n  name: \"a\"\n", 3, 1, "missing '}' to close the message opened at 1:7"},
		{"stray brace", "name: \"m\" }", 1, 11, "unexpected '}'"},
		{"not repeated", "name: \"a\" name: \"b\"", 1, 11, `field "name" is set more than once`},
		{"oneof", "dynamic_batching {} sequence_batching {}", 1, 21, "both belong to oneof"},
		{"list on scalar", "name: [ \"a\" ]", 1, 7, "is not repeated"},
		{"int range", "max_batch_size: 4294967296", 1, 17, "out of range"},
		{"unsigned negative", "dynamic_batching { max_queue_delay_microseconds: -1 }", 1, 50, "cannot be negative"},
		{"float in int", "max_batch_size: 1.5", 1, 17, "expected an integer"},
		{"bad number", "max_batch_size: 12abc", 1, 17, `invalid number "12abc"`},
		{"bad char", "name: \"m\" @", 1, 11, "unexpected character '@'"},
		{"bad escape", `name: "\q"`, 1, 8, `unknown escape sequence \q`},
		{"invalid utf8", "name: \"\\377\"", 1, 7, "not valid UTF-8"},
		{"column counts characters", "name: \"é\" x: 1", 1, 11, `unknown field "x"`},
		{"list without comma", "input [ { } { } ]", 1, 13, "expected ',' or ']'"},
		{"bad bool", "response_cache { enable: yes }", 1, 26, "expected true or false"},
		{"extension", "[foo.bar]: 1", 1, 1, "extensions and Any"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.text))
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) = %v, want a *SyntaxError", tc.text, err)
			}
			if se.Line != tc.line || se.Col != tc.col || !strings.Contains(se.Msg, tc.msg) {
				t.Errorf("Parse(%q) = %d:%d: %s, want %d:%d: ...%s...", tc.text, se.Line, se.Col, se.Msg, tc.line, tc.col, tc.msg)
			}
		})
	}
}

func TestParseFileNamesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), ConfigFile)
	if err := os.WriteFile(path, []byte("name: \"m\"\nbogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ParseFile(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":2:1: ") {
		t.Errorf("ParseFile = %v, want an error starting with %s:2:1:", err, path)
	}
}

func TestPrintQuote(t *testing.T) {
	for _, s := range []string{"", "plain", "tab\there", "quote\"back\\", "nul\x00", "\u2028line sep", "ünïcødé", "\x7f"} {
		c := &configpb.ModelConfig{Name: s}
		back, err := Parse(Print(c))
		if err != nil || back.GetName() != s {
			t.Errorf("Parse(Print(name %q)) = %q, %v; want the same string", s, back.GetName(), err)
		}
	}
}

func TestPrintEmptyAndPresence(t *testing.T) {
	c, err := Parse([]byte(`version_policy { all { } } dynamic_batching { } model_warmup [ { inputs { key: "x" value { zero_data: false } } } ]`))
	if err != nil {
		t.Fatal(err)
	}
	got := string(Print(c))
	want := `version_policy {
  all { }
}
dynamic_batching { }
model_warmup [
  {
    inputs {
      key: "x"
      value {
        zero_data: false
      }
    }
  }
]
`
	if got != want {
		t.Errorf("Print =\n%s\nwant\n%s", got, want)
	}
}
