// Package dashboardbench measures the web dashboard's sandboxes page in
// headless Chromium with 200 sandboxes listed: from navigation to the
// table drawn, against a reference measured in the same run and browser,
// a plain fetch of the same list from the same server. The list is served
// by a handler answering GET /v2/sandboxes (paged by 100, X-Next-Token),
// /templates and /nodes with the API's own types, since 200 VMs do not fit
// a test machine; what is measured is the dashboard's part (its files, the
// paging of the list, the drawing of the page), not the node's list.
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/dashboard
package dashboardbench
