-- @P1 = Bound
SELECT COUNT_BIG(*) AS ESTIMATE FROM [app].[Item Log] AS T WHERE T.[Row Version] <= CAST(@P1 AS BINARY(8)) AND T.[Deleted At] IS NULL
