package onnx_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/testutil"
	"github.com/kiln-ml/kiln/onnx"
	"github.com/kiln-ml/kiln/onnx/onnxpb"
	"google.golang.org/protobuf/proto"
)

func corpusModels(t *testing.T) []string {
	t.Helper()
	root := testutil.Corpus(t)
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".onnx") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 70 {
		t.Fatalf("found only %d .onnx files in the corpus, want at least 70", len(files))
	}
	return files
}

// Every corpus model parses with nothing left in unknown fields, and
// re-marshals to bytes that parse to an equal message.
func TestCorpusRoundTrip(t *testing.T) {
	for _, path := range corpusModels(t) {
		rel, _ := filepath.Rel(testutil.Corpus(t), path)
		t.Run(rel, func(t *testing.T) {
			m, err := onnx.Load(path)
			if err != nil {
				t.Fatalf("Load(%s) = %v", rel, err)
			}
			if u := onnx.UnknownFields(m.Proto); len(u) > 0 {
				t.Errorf("UnknownFields(%s) = %v, want none", rel, u)
			}
			data, err := m.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			m2, err := onnx.Parse(data, filepath.Dir(path))
			if err != nil {
				t.Fatalf("Parse(Marshal(%s)) = %v", rel, err)
			}
			if !proto.Equal(m.Proto, m2.Proto) {
				t.Errorf("Parse(Marshal(%s)) differs from the loaded model", rel)
			}
			data2, _ := m2.Marshal()
			if !bytes.Equal(data, data2) {
				t.Errorf("Marshal is not stable for %s", rel)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	good, err := os.ReadFile(filepath.Join(testutil.Corpus(t, "onnx-node", "test_relu"), "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty.onnx", nil, "file is empty"},
		{"truncated.onnx", good[:len(good)/2], "truncated or not a model"},
		{"text.onnx", []byte("this is not a model\n"), "not"},
		{"nograph.onnx", mustMarshal(t, &onnxpb.ModelProto{IrVersion: proto.Int64(7)}), "no graph"},
		{"noir.onnx", mustMarshal(t, &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{Name: proto.String("g")}}), "ir_version"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name)
			if err := os.WriteFile(p, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := onnx.Load(p)
			if err == nil {
				t.Fatalf("Load(%s) = nil error, want %q", c.name, c.want)
			}
			if !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Load(%s) = %q, want it to name the file and say %q", c.name, err, c.want)
			}
		})
	}
	if _, err := onnx.Load(filepath.Join(dir, "missing.onnx")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want os.ErrNotExist", err)
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// externalModel builds a model with one initializer stored externally at location.
func externalModel(location string, offset, length int) *onnxpb.ModelProto {
	dt := int32(onnx.Float)
	kv := []*onnxpb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String(location)}}
	if offset >= 0 {
		kv = append(kv, &onnxpb.StringStringEntryProto{Key: proto.String("offset"), Value: proto.String(itoa(offset))})
	}
	if length >= 0 {
		kv = append(kv, &onnxpb.StringStringEntryProto{Key: proto.String("length"), Value: proto.String(itoa(length))})
	}
	loc := onnxpb.TensorProto_EXTERNAL
	return &onnxpb.ModelProto{
		IrVersion:   proto.Int64(8),
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Version: proto.Int64(13)}},
		Graph: &onnxpb.GraphProto{
			Name: proto.String("g"),
			Node: []*onnxpb.NodeProto{{OpType: proto.String("Add"), Input: []string{"x", "w"}, Output: []string{"y"}}},
			Initializer: []*onnxpb.TensorProto{{
				Name: proto.String("w"), DataType: &dt, Dims: []int64{2},
				ExternalData: kv, DataLocation: &loc,
			}},
			Input:  []*onnxpb.ValueInfoProto{onnx.TensorType("x", onnx.Float, onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Value: 2, Known: true}}})},
			Output: []*onnxpb.ValueInfoProto{onnx.TensorType("y", onnx.Float, onnx.Shape{Ranked: true, Dims: []onnx.Dim{{Value: 2, Known: true}}})},
		},
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestExternalData(t *testing.T) {
	dir := t.TempDir()
	// Two float32s, 1.5 and -2, after 4 bytes of padding.
	data := []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0}
	if err := os.WriteFile(filepath.Join(dir, "weights.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret.bin"), data, 0o644)
	os.Symlink(filepath.Join(outside, "secret.bin"), filepath.Join(dir, "link.bin"))

	cases := []struct {
		name     string
		location string
		offset   int
		length   int
		want     []float32
		wantErr  string
	}{
		{"offset and length", "weights.bin", 4, 8, []float32{1.5, -2}, ""},
		{"escapes with dotdot", "../secret.bin", 4, 8, nil, "escapes the model directory"},
		{"absolute path", filepath.Join(outside, "secret.bin"), 4, 8, nil, "escapes the model directory"},
		{"symlink outside", "link.bin", 4, 8, nil, "outside the model directory"},
		{"range past end", "weights.bin", 8, 8, nil, "outside weights.bin"},
		{"missing file", "nope.bin", 0, 8, nil, "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, "model.onnx")
			if err := os.WriteFile(p, mustMarshal(t, externalModel(c.location, c.offset, c.length)), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := onnx.Load(p)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Load = %v, want error containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load = %v", err)
			}
			tt, err := onnx.Decode(m.Initializer("w"))
			if err != nil {
				t.Fatal(err)
			}
			got := tt.Data.([]float32)
			if len(got) != 2 || got[0] != c.want[0] || got[1] != c.want[1] {
				t.Errorf("external weights = %v, want %v", got, c.want)
			}
			if m.HasExternalData() {
				t.Error("HasExternalData() = true after loading")
			}
		})
	}
	t.Run("skip external", func(t *testing.T) {
		p := filepath.Join(dir, "model.onnx")
		os.WriteFile(p, mustMarshal(t, externalModel("weights.bin", 4, 8)), 0o644)
		m, err := onnx.LoadWith(p, onnx.LoadOptions{SkipExternalData: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := onnx.Decode(m.Initializer("w")); !errors.Is(err, onnx.ErrExternalData) {
			t.Errorf("Decode(unloaded external) = %v, want ErrExternalData", err)
		}
	})
	t.Run("bytes refuse external", func(t *testing.T) {
		if _, err := onnx.Parse(mustMarshal(t, externalModel("weights.bin", 4, 8)), ""); err == nil {
			t.Error("Parse(bytes with external data, no dir) = nil error")
		}
	})
}

func TestSaveAtomic(t *testing.T) {
	dir := t.TempDir()
	m, err := onnx.Load(filepath.Join(testutil.Corpus(t, "onnx-node", "test_relu"), "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.onnx")
	if err := os.WriteFile(out, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Save(out); err != nil {
		t.Fatal(err)
	}
	m2, err := onnx.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m.Proto, m2.Proto) {
		t.Error("Save then Load gives a different model")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after Save, want only out.onnx (no temp files)", len(entries))
	}
	// A save into a directory that does not exist fails and writes nothing.
	if err := m.Save(filepath.Join(dir, "no", "such", "dir.onnx")); err == nil {
		t.Error("Save into a missing directory = nil error")
	}
}
