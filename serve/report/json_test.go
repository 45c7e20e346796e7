package report

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/testutil"
)

func writeJSON(t testing.TB, r *Report) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteJSON(&b, r); err != nil {
		t.Fatalf("WriteJSON: %v", err)
	}
	return b.Bytes()
}

func TestWriteJSON(t *testing.T) {
	for name, r := range map[string]*Report{"tinynet": tinynet(), "random": randomData(), "empty": empty()} {
		t.Run(name, func(t *testing.T) {
			testutil.GoldenFile(t, filepath.Join("testdata", "TestWriteJSON", name+".golden"), writeJSON(t, r))
		})
	}
}

func TestJSONRoundTrip(t *testing.T) {
	for name, r := range map[string]*Report{"tinynet": tinynet(), "random": randomData(), "empty": empty(), "hostile": hostile()} {
		t.Run(name, func(t *testing.T) {
			b := writeJSON(t, r)
			got, err := ReadJSON(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("ReadJSON(WriteJSON(%s)): %v", name, err)
			}
			if !reflect.DeepEqual(got, r) {
				t.Errorf("ReadJSON(WriteJSON(x)) != x:\n got %+v\nwant %+v", got, r)
			}
		})
	}
}

func TestMeasurementWindowIsMilliseconds(t *testing.T) {
	b := writeJSON(t, tinynet())
	if !bytes.Contains(b, []byte(`"measurement_window_ms": 5000,`)) {
		t.Errorf("WriteJSON: no \"measurement_window_ms\": 5000 in\n%s", b)
	}
}

func TestReadJSONStrict(t *testing.T) {
	good := string(writeJSON(t, tinynet()))
	tests := []struct {
		name, json, wantErr string
	}{
		{"unknown top-level field", strings.Replace(good, `"tool"`, `"tool_name": 1, "tool"`, 1), `unknown field "tool_name"`},
		{"unknown nested field", strings.Replace(good, `"concurrency": 1,`, `"concurrency": 1, "qps": 3,`, 1), `unknown field "qps"`},
		{"unknown metrics field", strings.Replace(good, `"cosine": 0.999996,`, `"cosine": 0.999996, "psnr": 40,`, 1), `unknown field "psnr"`},
		{"newer schema", strings.Replace(good, `"schema_version": 1`, `"schema_version": 2`, 1), "schema_version 2, want 1"},
		{"no schema", strings.Replace(good, `"schema_version": 1,`, ``, 1), "schema_version 0, want 1"},
		{"bad verdict", strings.Replace(good, `"verdict": "fail"`, `"verdict": "meh"`, 1), `verdict "meh"`},
		{"bad model verdict", strings.Replace(good, `"verdict": "not-checked"`, `"verdict": "skipped"`, 1), `models[3] (tinynet_trt_fp16): verdict "skipped"`},
		{"bad data kind", strings.Replace(good, `"kind": "dataset"`, `"kind": "imagenet"`, 1), `data.kind "imagenet"`},
		{"negative window", strings.Replace(good, `"measurement_window_ms": 5000`, `"measurement_window_ms": -1`, 1), "out of range"},
		{"huge window", strings.Replace(good, `"measurement_window_ms": 5000`, `"measurement_window_ms": 9223372036855`, 1), "out of range"},
		{"trailing data", good + "{}", "data after the report"},
		{"not an object", `[1, 2]`, "decoding report"},
		{"null", `null`, "schema_version 0"},
		{"empty", ``, "EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.json == good {
				t.Fatalf("test case did not change the input")
			}
			_, err := ReadJSON(strings.NewReader(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ReadJSON() error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// jsonFields lists, per struct type reachable from t, the JSON names of
// its fields.
func jsonFields(t reflect.Type, out map[string][]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
		return
	}
	if _, seen := out[t.Name()]; seen {
		return
	}
	out[t.Name()] = []string{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[t.Name()] = append(out[t.Name()], name)
		jsonFields(f.Type, out)
	}
}

// TestSchemaDocumentsEveryField keeps SCHEMA.md from drifting: every JSON
// field of every type in a report is in the table of its type's section.
func TestSchemaDocumentsEveryField(t *testing.T) {
	doc, err := os.ReadFile("SCHEMA.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	heading := regexp.MustCompile("(?m)^### `?([A-Za-z]+)`?.*$")
	locs := heading.FindAllSubmatchIndex(doc, -1)
	for i, loc := range locs {
		end := len(doc)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		sections[string(doc[loc[2]:loc[3]])] = string(doc[loc[1]:end])
	}
	types := map[string][]string{}
	jsonFields(reflect.TypeFor[Report](), types)
	if len(types) < 9 {
		t.Fatalf("found only types %v; the walk misses some", types)
	}
	for typ, fields := range types {
		sec, ok := sections[typ]
		if !ok {
			t.Errorf("SCHEMA.md has no section \"### %s\"", typ)
			continue
		}
		for _, f := range fields {
			if !strings.Contains(sec, "| `"+f+"`") {
				t.Errorf("SCHEMA.md section %s has no row for field `%s`", typ, f)
			}
		}
		// And no row for a field that is gone.
		for _, m := range regexp.MustCompile("(?m)^\\| `([a-z0-9_]+)`").FindAllStringSubmatch(sec, -1) {
			if !strings.Contains(" "+strings.Join(fields, " ")+" ", " "+m[1]+" ") {
				t.Errorf("SCHEMA.md section %s documents `%s`, which %s does not have", typ, m[1], typ)
			}
		}
	}
}

func FuzzReadJSON(f *testing.F) {
	for _, r := range []*Report{tinynet(), randomData(), empty(), hostile()} {
		f.Add(writeJSON(f, r))
	}
	f.Add([]byte(`{"schema_version":1,"data":{"kind":"random"},"verdict":"pass","models":[{"verdict":"pass","perf":{"measurement_window_ms":3}}]}`))
	f.Add([]byte(`{"schema_version":1,"created":"2026-01-02T03:04:05.123456789+05:30","data":{"kind":"inputs"},"verdict":"error"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ReadJSON(bytes.NewReader(in))
		if err != nil {
			return
		}
		// Whatever parses is written, and what is written reads back to the
		// same report: the same bytes again.
		var b1 bytes.Buffer
		if err := WriteJSON(&b1, r); err != nil {
			t.Fatalf("WriteJSON of a parsed report: %v", err)
		}
		r2, err := ReadJSON(bytes.NewReader(b1.Bytes()))
		if err != nil {
			t.Fatalf("ReadJSON(WriteJSON(x)): %v\n%s", err, b1.Bytes())
		}
		var b2 bytes.Buffer
		if err := WriteJSON(&b2, r2); err != nil {
			t.Fatalf("WriteJSON second time: %v", err)
		}
		if !bytes.Equal(b1.Bytes(), b2.Bytes()) {
			t.Fatalf("round trip changed the report:\n%s\n---\n%s", b1.Bytes(), b2.Bytes())
		}
		// The renderers take any report that parses.
		var sink bytes.Buffer
		if err := WriteMarkdown(&sink, r); err != nil {
			t.Fatalf("WriteMarkdown: %v", err)
		}
		if err := WriteHTML(&sink, r); err != nil {
			t.Fatalf("WriteHTML: %v", err)
		}
	})
}
