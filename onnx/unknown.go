package onnx

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// UnknownFields lists the messages in m that carry fields kiln's schema does
// not know, as "Message(field numbers...)" paths. An empty result for a
// model means the schema covered everything in it.
func UnknownFields(m proto.Message) []string {
	var out []string
	var walk func(path string, msg protoreflect.Message)
	walk = func(path string, msg protoreflect.Message) {
		if raw := msg.GetUnknown(); len(raw) > 0 {
			out = append(out, path+"("+string(msg.Descriptor().Name())+")")
		}
		msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
				return true
			}
			p := path + "." + string(fd.Name())
			switch {
			case fd.IsList():
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					walk(p, l.Get(i).Message())
				}
			case fd.IsMap():
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(p, mv.Message())
					return true
				})
			default:
				walk(p, v.Message())
			}
			return true
		})
	}
	walk(string(m.ProtoReflect().Descriptor().Name()), m.ProtoReflect())
	return out
}
