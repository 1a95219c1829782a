package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/runtime/oci"
)

// TestMachineRunscIsTheDriversRunsc: the machine facts of a bench run
// name the runsc that corral's gVisor sandboxes ran under (the pinned
// build when it is cached), not whichever runsc is first in PATH
// (Debian's 2022 build on this host): a gVisor figure published beside
// the wrong version would misstate what was measured.
func TestMachineRunscIsTheDriversRunsc(t *testing.T) {
	r, err := oci.FindRunsc("", "")
	if err != nil {
		t.Skipf("no runsc: %v", err)
	}
	got := runscVersion()
	if st, err := os.Stat(oci.CachedRunsc("")); err == nil && st.Mode().IsRegular() {
		if want := oci.RunscVersion(); !strings.HasPrefix(got, want) {
			t.Fatalf("machine runsc = %q, want the pinned build %q", got, want)
		}
		return
	}
	if !strings.Contains(got, r.Path) {
		t.Fatalf("machine runsc = %q, want it to name %s", got, r.Path)
	}
}
