// Package safetext holds the one rule for text a caller names that the
// server stores, logs or shows (metadata, agent names, query parameter
// values): valid UTF-8 without control characters. It defends against a
// value that forges lines or moves the cursor where it is shown or
// logged, and a NUL that other readers would cut it at.
package safetext

import "unicode/utf8"

// Clean reports whether s is valid UTF-8 without C0 control characters
// or DEL; with whitespace, tab, newline and carriage return are allowed.
func Clean(s string, whitespace bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if (c < 0x20 || c == 0x7f) && !(whitespace && (c == '\t' || c == '\n' || c == '\r')) {
			return false
		}
	}
	return true
}
