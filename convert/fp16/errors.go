package fp16

import (
	"errors"
	"fmt"
)

// UnsupportedError is returned, wrapped with the model's name, when Convert
// refuses a model it cannot rewrite correctly. It is returned before
// anything is written. Callers branch on it with errors.As, and on Reason
// to tell the user what to do (block the node, add value_info, upgrade the
// opset).
type UnsupportedError struct {
	// Node labels the node refused (its name, or "Op(outputs)" when it has
	// none); "" when the model as a whole is refused.
	Node string
	// Op is the node's op type, "" for the model.
	Op string
	// Reason is a short, stable phrase naming the kind of refusal (one of
	// the Reason* constants).
	Reason string
	// Detail says what exactly, naming the tensor or domain.
	Detail string
}

// Reasons an UnsupportedError gives.
const (
	ReasonCustomDomain = "operator from a domain whose types the rewrite does not know"
	ReasonSequence     = "sequence or optional values"
	ReasonUntyped      = "output element type unknown"
	ReasonOldOpset     = "opset too old"
	ReasonNoSubgraph   = "control-flow node without a subgraph"
)

func (e *UnsupportedError) Error() string {
	if e.Node == "" {
		return fmt.Sprintf("%s: %s", e.Reason, e.Detail)
	}
	return fmt.Sprintf("node %s (%s): %s: %s", e.Node, e.Op, e.Reason, e.Detail)
}

// ErrAlreadyFloat16 is returned, wrapped with the model's name, by Convert
// for a model that already holds float16 tensors.
var ErrAlreadyFloat16 = errors.New("the model already uses float16")
