package procsvc_test

import (
	"net/http"
)

// h2cClient speaks cleartext HTTP/2, which client-streaming RPCs need.
func h2cClient() *http.Client {
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}
