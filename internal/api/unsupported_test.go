package api

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/corralhq/corral/internal/runtime"
)

// TestUnsupportedIsNotInternal: an operation the runtime driver does not
// offer (pause of a Kubernetes Pod) is the caller's to know about, with a
// stable code, not an "internal error" that sends operators to the log.
func TestUnsupportedIsNotInternal(t *testing.T) {
	f := classify(fmt.Errorf("pause sandbox x: %w", fmt.Errorf("kube: %w", runtime.ErrUnsupported)))
	if f.status != http.StatusNotImplemented || f.code != CodeNotSupported || f.internalError {
		t.Fatalf("classify(ErrUnsupported) = %+v; want 501 %s", f, CodeNotSupported)
	}
}
